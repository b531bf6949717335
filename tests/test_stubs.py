"""The type stubs of the compiled modules (moe_cpu's, moe_numba's C launcher and replays) match the
modules: ``mypy.stubtest`` imports each extension and compares every name, parameter (name,
kind, default) and constant with its stub."""

import os
import re
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
REPLAYS_INTERNALS = [
    r"moe_numba\.torch\._replay_c\.__test__",
    r"moe_numba\.torch\._replay_c\.\w+\.__reduce_cython__",
    r"moe_numba\.torch\._replay_c\.\w+\.__setstate_cython__",
]
# The compiled modules and their stubs: moe_cpu's extensions, the C launcher, the replays.
STUBBED = ["moe_cpu", "moe_numba.runtime._driver_c", "moe_numba.torch._replay_c"]
STUBS = [
    *Path(moe_cpu.__file__).parent.glob("_*.pyi"),
    Path(moe_numba.__file__).parent / "runtime" / "_driver_c.pyi",
    Path(moe_numba.__file__).parent / "torch" / "_replay_c.pyi",
]
# mypy analyses every module that the stubbed modules' packages import, torch's too, which
# takes it most of its run; no stub names a torch type (test_no_stub_names_torch), so torch
# is left unanalysed and every comparison stays the same.
MYPY_CONFIG = """\
[mypy]
[mypy-torch.*]
follow_imports = skip
"""


def _stubtest(tmp_path, *modules, allow):
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text("\n".join(allow) + "\n")
    config = tmp_path / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    # mypy finds an installed package in site-packages (PEP 561: py.typed), but cannot follow
    # the import hook of an editable install: point it, and stubtest's own import of the
    # modules, at the moe_cpu that this process imported
    root = Path(moe_cpu.__file__).resolve().parent.parent
    installed = root in {Path(p).resolve() for p in site.getsitepackages()}
    env = dict(os.environ)
    if not installed:
        env.update(MYPYPATH=str(root), PYTHONPATH=str(root))
    command = [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(config)]
    return subprocess.run(
        [*command, "--allowlist", str(allowlist), *modules],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_stubs_match_the_compiled_modules(tmp_path):
    """One stubtest run over every compiled module (each run analyses the packages anew)."""
    allow = CYTHON_INTERNALS + C_LAUNCHER_INTERNALS + REPLAYS_INTERNALS
    done = _stubtest(tmp_path, *STUBBED, allow=allow)
    assert done.returncode == 0, done.stdout + done.stderr
    # a stub for every extension, and stubtest saw them all (moe_cpu's modules, the C
    # launcher and the replays)
    package = Path(moe_cpu.__file__).parent
    extensions = {
        p.name.split(".")[0] for suffix in EXTENSION_SUFFIXES for p in package.glob(f"_*{suffix}")
    }
    stubs = {p.stem for p in package.glob("_*.pyi")}
    assert extensions and extensions == stubs
    sources = {p.stem for p in package.glob("_*.py")} - {"__init__"}  # pure Python
    modules = len(stubs) + len(sources) + 1 + 2
    assert f"in {modules} modules" in done.stdout, done.stdout


def test_no_stub_names_torch():
    """The stubtest run leaves torch unanalysed (MYPY_CONFIG): a stub that named a torch type
    would be compared against nothing."""
    assert all(p.is_file() for p in STUBS), STUBS
    for stub in STUBS:
        imports = re.findall(r"^\s*(?:from|import)\s+(\w+)", stub.read_text(), re.MULTILINE)
        assert "torch" not in imports, f"{stub} imports torch"


def test_packages_are_typed():
    for package in (moe_numba, moe_cpu):
        assert (Path(package.__file__).parent / "py.typed").is_file(), package.__name__
