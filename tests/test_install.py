"""What an install gives: the CPU backend without the GPU stack, and the build that was asked
for (OpenMP or serial)."""

import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import moe_cpu
from moe_numba._environment import switch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in a fresh interpreter: a permute and a weighted unpermute on NumPy arrays, checked bit
# for bit against the oracle, then the list of what got imported.
_CPU_CALLS = textwrap.dedent(
    """
    import sys

    GPU_STACK = ("numba", "numba_cuda", "llvmlite", "cuda", "torch", "cupy")
    if sys.argv[1] == "absent":
        # None in sys.modules makes `import numba` raise ModuleNotFoundError and
        # importlib.util.find_spec("numba") return None, as when it is not installed
        for name in GPU_STACK:
            sys.modules[name] = None

    import numpy as np
    from moe_numba import oracle, moe_permute, moe_unpermute
    from moe_numba._demo import docs_example_inputs

    hidden, routemap, probs = docs_example_inputs()
    args = (hidden, None, routemap, probs, 3, [1, 2, 1], 2)
    permuted = moe_permute(*args)
    want, _ = oracle.permute(*args)
    for got, expected in zip(permuted, want, strict=True):
        assert (got is None) == (expected is None)
        if got is not None:
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert got.tobytes() == expected.tobytes()
    rows, rowmap, row_probs, _ = permuted
    combined = moe_unpermute(rows, rowmap, routemap, row_probs, 3, 3, using_weighted_combine=True)
    want, _ = oracle.unpermute(rows, rowmap, routemap, row_probs, 3, 3,
                                using_weighted_combine=True)
    for got, expected in zip(combined, want, strict=True):
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
    loaded = sorted(
        name for name, module in sys.modules.items()
        if module is not None and name.partition(".")[0] in GPU_STACK
    )
    print("loaded:", loaded)
    """
)


def _cpu_calls(gpu_stack, *code):
    return subprocess.run(
        [sys.executable, "-c", _CPU_CALLS + "".join(code), gpu_stack],
        capture_output=True,
        text=True,
        check=False,
    )


def test_cpu_calls_without_the_gpu_stack():
    """A CPU user's install has neither numba nor numba-cuda: the package imports, runs on the
    CPU and gets the oracle's bits; the demo looks for a GPU, finds none and runs there."""
    done = _cpu_calls(
        "absent",
        "from moe_numba.__main__ import main\n",
        "sys.exit(main(['demo', '--tokens=64', '--hidden=32', '--experts=6', '--topk=2']))\n",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded: []" in done.stdout
    assert "backend: cpu" in done.stdout
    assert "all outputs identical to the oracle" in done.stdout


def test_cpu_calls_do_not_import_the_gpu_stack():
    """With numba installed (as in the test extra), NumPy calls leave it unimported."""
    done = _cpu_calls("installed")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded: []" in done.stdout


def test_openmp_is_as_built():
    """The default build must have OpenMP (a failed compiler probe silently makes every loop
    serial); MOE_USE_OPENMP=0, for the build and the test run, asks for the serial build."""
    if switch("MOE_USE_OPENMP", True):  # (setup.py's reading of its build switch)
        assert moe_cpu.openmp_enabled(), (
            "moe_cpu was built without OpenMP: the compiler's -fopenmp probe failed (the build "
            "log says why). Install an OpenMP runtime (libgomp) and rebuild, or set "
            "MOE_USE_OPENMP=0 for a serial build on purpose."
        )
    else:
        assert not moe_cpu.openmp_enabled(), "MOE_USE_OPENMP=0, but moe_cpu has OpenMP"
        assert moe_cpu.get_num_threads() == 1


# Runs in a fresh interpreter without numba: each op is called with objects that have
# ``__cuda_array_interface__`` (a CUDA array of any producer) and must raise
# GPUUnavailableError, which says what to install.
_CUDA_CALLS_WITHOUT_NUMBA = textwrap.dedent(
    """
    import sys

    sys.modules["numba"] = None  # `import numba` fails, as when it is not installed

    from moe_numba import GPUUnavailableError, moe_permute, moe_unpermute

    class CudaArray:
        def __init__(self, shape, typestr):
            self.__cuda_array_interface__ = {
                "shape": shape, "typestr": typestr, "data": (0, False), "version": 3,
                "strides": None,
            }

    hidden, routemap, probs = CudaArray((4, 8), "<f4"), CudaArray((4, 2), "<i4"), CudaArray(
        (4, 2), "<f4"
    )
    calls = {
        "moe_permute": lambda: moe_permute(hidden, None, routemap, probs, 3, [2, 2, 2], 1),
        "moe_unpermute": lambda: moe_unpermute(
            CudaArray((6, 8), "<f4"), CudaArray((4, 3), "<i4"), routemap, CudaArray((6,), "<f4"),
            4, 3,
        ),
    }
    for name, call in calls.items():
        try:
            call()
        except GPUUnavailableError as error:
            print(name, "GPUUnavailableError:", error)
        except Exception as error:
            print(name, "WRONG", type(error).__name__, error)
        else:
            print(name, "WRONG: no error")
    """
)


def test_cuda_arrays_without_numba_raise_gpu_unavailable():
    """An install without the GPU stack meets a CUDA array (``__cuda_array_interface__``):
    every op raises GPUUnavailableError naming the GPU extra, not numba's import error."""
    done = subprocess.run(
        [sys.executable, "-c", _CUDA_CALLS_WITHOUT_NUMBA],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert "WRONG" not in line, line
        assert "GPUUnavailableError: CUDA arrays were passed" in line
        assert "pip install -e '.[gpu]' in the moe-numba checkout" in line


def test_a_bad_build_job_count_is_refused():
    """``MOE_BUILD_JOBS`` must be a whole number of at least 1; the build says so, before
    Cython runs (which would regenerate the tree's C files)."""
    pytest.importorskip("Cython", reason="setup.py needs Cython (the build requirements)")
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext"],  # refused before it compiles
        cwd=ROOT,
        env=dict(os.environ, MOE_BUILD_JOBS="zero"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "MOE_BUILD_JOBS: expected a whole number of at least 1; got 'zero'" in done.stderr
    assert "Cythonizing" not in done.stdout + done.stderr


def test_the_test_extra_has_the_build_requirements():
    """The tests that run setup.py need its build requirements in the test venv (pip builds
    the project in an environment of its own): without them they skip there."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and newer")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    assert set(config["build-system"]["requires"]) <= set(
        config["project"]["optional-dependencies"]["test"]
    )


def test_an_unchanged_build_is_kept(tmp_path):
    """A build from unchanged sources copies the extensions that an earlier build of the
    same kind kept in build/<kind>/kept instead of compiling them again (pip install -e
    builds in a new temporary directory every time)."""
    pytest.importorskip("Cython", reason="setup.py needs Cython (the build requirements)")
    kept = glob.glob(os.path.join(ROOT, "build", "*", "kept"))
    if not kept:
        pytest.skip("no build/*/kept: this tree's extensions were not built by its setup.py")
    tree = tmp_path / "tree"
    for name in ("moe_cpu", "moe_numba"):
        shutil.copytree(
            os.path.join(ROOT, name), tree / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(os.path.join(ROOT, name), tree / name)
    for path in kept:
        shutil.copytree(path, tree / os.path.relpath(path, ROOT))
    # the C files as the last build compiled them: Cython regenerates one whose .pxd files
    # are newer (a venv installed after the build), and its table of file names then names
    # this interpreter's Cython, which differs from the build's (another fingerprint)
    for path in tree.glob("moe_*/**/*.c"):
        os.utime(path)
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = [line for line in done.stderr.splitlines() if "moe-numba build: compil" in line]
    assert not compiled, "\n".join(compiled)
    assert done.stderr.count("moe-numba build: kept ") == 8, done.stderr[-3000:]


def test_the_transformers_module_without_torch_says_what_to_install():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['torch'] = None\n"  # `import torch` fails, as uninstalled
            "try:\n    import moe_numba.transformers\n"
            "except ModuleNotFoundError as error:\n    print(error.name, '|', error)\n",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "torch | moe_numba.transformers needs torch (and transformers>=5): pip install -e "
        "'.[transformers]' in the moe-numba checkout (it is not on PyPI yet)"
    )


def test_every_install_command_installs_from_the_checkout():
    """moe-numba is not on PyPI yet: no command shown to a user installs it by name."""
    by_name = re.compile(r"pip install [\"']?moe-numba")
    shown = [
        os.path.relpath(path, ROOT)
        for pattern in (
            "README.md",
            "docs/*.rst",
            "moe_numba/**/*.py",
            "tools/*.py",
            "benchmarks/*.py",
        )
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True)
    ]
    found = []
    for path in shown:
        with open(os.path.join(ROOT, path)) as f:
            found += [f"{path}: {line.strip()}" for line in f if by_name.search(line)]
    assert len(shown) > 20 and not found, "\n".join(found)
