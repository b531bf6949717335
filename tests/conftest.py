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

In the simulator's process ``test_ptx.py`` is not collected at all (its imports need the real
target), so that the session's counts add up: every collected test passes, fails or is
skipped. The header counts the skips known at collection by reason, and the terminal summary
counts every skip of the run by reason (``-rs`` lists them one by one).
"""

import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

# The benchmarks' tests import ``benchmarks`` from the checkout's top folder, which no wheel
# installs. Appended, not prepended: where moe_numba is installed (tox tests the wheel from a
# scratch folder), the installed moe_numba and moe_cpu still come first, and only
# ``benchmarks`` comes from the checkout. ``python -m pytest`` from the checkout's root has
# the root first on the path already.
CHECKOUT = str(Path(__file__).resolve().parent.parent)
if CHECKOUT not in sys.path:
    sys.path.append(CHECKOUT)

import pytest  # noqa: E402

from _backends import BACKENDS, available_backends, simulator_on  # noqa: E402

SIM_COMMAND = "NUMBA_ENABLE_CUDASIM=1 python -m pytest -m sim -n auto"
PTX_MODULE = "test_ptx.py"

# A module that skips itself at collection counts as one skip but is no test: the
# simulator's process leaves the PTX module out instead, and the header says so.
collect_ignore = [PTX_MODULE] if simulator_on() else []

if simulator_on():  # (every process of the run: xdist's workers load this file too)
    import _simulator

    _simulator.share_arrays_safely()
    _simulator.switch_threads_often()


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
        _sources(),
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
        if marker == "ptx" and simulator_on():
            lines.append(f"{what}: tests/{PTX_MODULE} not collected in the simulator ({elsewhere})")
        elif not marked:
            lines.append(f"{what}: not selected")
        elif skipped:
            lines.append(f"{what}: {skipped} tests skipped in this process ({elsewhere})")
        else:
            lines.append(f"{what}: {len(marked)} tests, {how}")
    planned = Counter(reason for reason in map(_skip_reason, items) if reason is not None)
    if planned:
        lines.append(
            f"{sum(planned.values())} of {len(items)} tests will be skipped here "
            "(more may skip themselves while running; the summary at the end counts them all):"
        )
        lines += [f"  {count:5d}  {reason}" for reason, count in planned.most_common()]
    return lines


def _skip_reason(item):
    """The reason of the ``skip`` or true ``skipif`` mark that skips ``item``, or None.

    As pytest does: the first true ``skipif`` decides, then ``skip`` (every condition in this
    suite is a bool computed at import).
    """
    for mark in item.iter_markers("skipif"):
        conditions = mark.args or (mark.kwargs.get("condition"),)
        if any(c for c in conditions if not isinstance(c, str)):
            return mark.kwargs.get("reason", "skipif")
    for mark in item.iter_markers("skip"):
        return mark.kwargs.get("reason", mark.args[0] if mark.args else "unconditional skip")
    return None


def _reported_reason(report):
    """The reason a skipped test's report gives (its ``longrepr`` is (path, line, reason))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _module_name(report):
    return report.nodeid.partition("::")[0].rpartition("/")[2]


def pytest_terminal_summary(terminalreporter):
    """Every skip of the run, counted by reason, with the modules that have most of them (the
    one-by-one list is ``-rs``; the default options list failures and errors only)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    modules = {}
    for report in skipped:
        modules.setdefault(_reported_reason(report), Counter())[_module_name(report)] += 1
    terminalreporter.section(f"{len(skipped)} skipped, by reason (-rs lists each)", sep="-")
    for reason, counts in sorted(modules.items(), key=lambda kv: -kv[1].total()):
        top = ", ".join(f"{name} {n}" for name, n in counts.most_common(3))
        more = len(counts) - 3
        top += f", {more} more module{'s' if more > 1 else ''}" if more > 0 else ""
        terminalreporter.write_line(f"{counts.total():5d}  {reason}  [{top}]")


def _cpu_build():
    try:
        import moe_cpu
    except ImportError as error:  # a checkout whose extensions were never built
        return f"moe_cpu: not importable ({error}); `pip install -e .` builds it"
    openmp = "OpenMP" if moe_cpu.openmp_enabled() else "serial (no OpenMP)"
    return f"moe_cpu: {openmp}, {moe_cpu.get_num_threads()} threads, from {moe_cpu.__file__}"


def _sources():
    """Where the library under test and the benchmarks come from (tox: the installed wheel
    and the checkout's ``benchmarks`` folder)."""
    import importlib.util

    found = {n: importlib.util.find_spec(n) for n in ("moe_numba", "benchmarks")}
    where = {n: os.path.dirname(spec.origin) if spec else "not found" for n, spec in found.items()}
    return f"moe_numba from {where['moe_numba']}; benchmarks from {where['benchmarks']}"
