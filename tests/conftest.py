"""Backend parametrisation for the whole suite, and the split between the processes.

Every test that takes the ``backend`` fixture runs once per backend in use:

- ``cpu``: NumPy arrays, the Cython backend;
- ``cudasim``: numba device arrays under numba's CUDA simulator (tiny shapes only);
- ``numba``, ``cupy``, ``torch``: CUDA arrays of that library on a real GPU.

``--backend`` picks them (comma-separated, or ``auto``: ``cpu``, plus the simulator where
``NUMBA_ENABLE_CUDASIM=1``, or plus every GPU kind whose library imports where a GPU is
usable).

numba reads ``NUMBA_ENABLE_CUDASIM`` once, at import, so one process runs either the real
CUDA target or the simulator, never both. The environment decides; this file only reads it.
Two markers say which process a test needs, and tests that need the other one are skipped
with the command that runs them:

- ``sim``: runs the kernels in the simulator (every ``cudasim`` case gets it here; modules
  that only make sense there set it themselves);
- ``ptx``: compiles the kernels with the real CUDA target (no GPU needed).
"""

import os

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

import pytest  # noqa: E402

from _backends import BACKENDS, available_backends, simulator_on  # noqa: E402

SIM_COMMAND = "NUMBA_ENABLE_CUDASIM=1 python -m pytest -m sim -n auto"


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
    simulated = [n for n in names if BACKENDS[n].simulated]
    if simulated and not simulator_on():
        raise pytest.UsageError(
            f"--backend {','.join(simulated)} runs in numba's CUDA simulator, which numba "
            "turns on only at import: set NUMBA_ENABLE_CUDASIM=1 in the environment"
        )
    real = [n for n in names if BACKENDS[n].needs_gpu]
    if real and simulator_on():
        raise pytest.UsageError(
            f"--backend {','.join(real)} needs a real GPU, and NUMBA_ENABLE_CUDASIM=1 "
            "replaces numba.cuda with the simulator: unset it"
        )
    return names


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        names = _selected(metafunc.config)
        params = [
            pytest.param(
                BACKENDS[n], id=n, marks=[pytest.mark.sim] if BACKENDS[n].simulated else []
            )
            for n in names
        ]
        metafunc.parametrize("backend", params)


def pytest_collection_modifyitems(config, items):
    if simulator_on():
        skip = pytest.mark.skip(
            reason="compiles with the real CUDA target: run without NUMBA_ENABLE_CUDASIM"
        )
        marker = "ptx"
    else:
        skip = pytest.mark.skip(reason=f"runs in numba's CUDA simulator: {SIM_COMMAND}")
        marker = "sim"
    for item in items:
        if item.get_closest_marker(marker):
            item.add_marker(skip)


def pytest_report_header(config):
    simulator = "on (NUMBA_ENABLE_CUDASIM=1)" if simulator_on() else "off"
    return [
        f"moe-numba backends under test: {', '.join(_selected(config))}",
        f"CUDA simulator: {simulator}; {_cpu_build()}",
    ]


def pytest_report_collectionfinish(config, start_path, items):
    """Say which of the two processes' tests run here, and how to run the others."""
    if os.environ.get("MOE_PTX_ALL") == "1":
        variants = "every variant of each kernel (MOE_PTX_ALL=1)"
    else:
        variants = "one variant of each kernel kind (MOE_PTX_ALL=1: every variant)"
    parts = {
        "ptx": ("PTX compile (real CUDA target)", variants, "run without NUMBA_ENABLE_CUDASIM"),
        "sim": ("GPU kernels in the simulator", "tiny shapes", f"run `{SIM_COMMAND}`"),
    }
    lines = []
    for marker, (what, how, elsewhere) in parts.items():
        marked = [item for item in items if item.get_closest_marker(marker)]
        skipped = sum(any(m.name == "skip" for m in item.iter_markers()) for item in marked)
        if not marked:
            lines.append(f"{what}: not selected")
        elif skipped:
            lines.append(f"{what}: {skipped} tests skipped in this process ({elsewhere})")
        else:
            lines.append(f"{what}: {len(marked)} tests, {how}")
    return lines


def _cpu_build():
    try:
        import moe_cpu
    except ImportError as error:  # a checkout whose extensions were never built
        return f"moe_cpu: not importable ({error}); `pip install -e .` builds it"
    openmp = "OpenMP" if moe_cpu.openmp_enabled() else "serial (no OpenMP)"
    return f"moe_cpu: {openmp}, {moe_cpu.get_num_threads()} threads, from {moe_cpu.__file__}"
