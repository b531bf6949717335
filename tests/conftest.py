"""Backend parametrisation for the whole suite.

Every test that takes the ``backend`` fixture runs once per backend in use:

- ``cpu``: NumPy arrays, the Cython backend;
- ``cudasim``: numba device arrays under numba's CUDA simulator (tiny shapes only);
- ``numba``, ``cupy``, ``torch``: CUDA arrays of that library on a real GPU.

``--backend`` picks them (comma-separated, or ``auto``: ``cpu`` plus the simulator where no
GPU is present, or every GPU kind whose library imports where one is).
"""

import os

# numba reads NUMBA_ENABLE_CUDASIM once, when it is first imported: decide before that.
if "NUMBA_ENABLE_CUDASIM" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

import pytest  # noqa: E402

from _backends import BACKENDS, available_backends  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        default="auto",
        help="comma-separated backends to test: cpu, cudasim, numba, cupy, torch, or auto",
    )


def _selected(config):
    option = config.getoption("--backend")
    if option == "auto":
        return available_backends()
    names = [name.strip() for name in option.split(",") if name.strip()]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise pytest.UsageError(f"--backend: unknown {unknown}; choose from {sorted(BACKENDS)}")
    return names


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        names = _selected(metafunc.config)
        metafunc.parametrize("backend", [BACKENDS[n] for n in names], ids=names)


def pytest_report_header(config):
    return f"moe-numba backends under test: {', '.join(_selected(config))}"
