"""What a record says about the run that made it: the commit (and whether the checkout had
changes), the date, the command, the device with its clocks, and the versions of the
software that ran.

Every piece that cannot be read is None (no git, no ``nvidia-smi``, a package that is not
installed): a record is still written, and says what it does not know.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# installed distributions whose versions a record keeps, where they are installed
PACKAGES = ("numpy", "ml_dtypes", "numba", "numba-cuda", "torch", "cupy", "transformers", "triton")


def _run(command, cwd=None):
    """The stripped stdout of ``command``, or None where it cannot run or fails."""
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit(checkout=CHECKOUT):
    """``(commit, dirty)`` of the git checkout the benchmarks run from: the full hash of
    HEAD and whether a tracked file differs from it (untracked files, such as new records,
    do not count); ``(None, None)`` outside a git checkout."""
    head = _run(["git", "rev-parse", "HEAD"], checkout)
    if head is None:
        return None, None
    changes = _run(["git", "status", "--porcelain", "--untracked-files=no"], checkout)
    return head, None if changes is None else bool(changes)


def slug(name):
    """``name`` in lower case, each run of other characters than letters and digits one
    ``-``: a card's folder name (``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def cpu_name():
    """The CPU's model name (``/proc/cpuinfo``, else the platform's word for it)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


_SMI_FIELDS = {
    "name": "name",
    "pci.bus_id": "pci_bus_id",
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "memory_clock_mhz",
    "clocks.max.sm": "max_sm_clock_mhz",
    "clocks.max.mem": "max_memory_clock_mhz",
    "clocks.applications.graphics": "application_sm_clock_mhz",
    "clocks.applications.memory": "application_memory_clock_mhz",
    "driver_version": "driver",
}


def parse_smi(text, bus_id=None):
    """The GPU of ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` output (the
    fields of :data:`_SMI_FIELDS`, in order) whose PCI bus id is ``bus_id`` (an int), else
    the first; clocks as ints (None where nvidia-smi has none)."""
    gpus = []
    for line in text.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(_SMI_FIELDS):
            continue
        gpu = dict(zip(_SMI_FIELDS.values(), values, strict=True))
        for key in gpu:
            if key.endswith("_mhz"):
                gpu[key] = int(gpu[key]) if gpu[key].isdigit() else None
        gpus.append(gpu)
    for gpu in gpus:
        if bus_id is not None and _bus(gpu["pci_bus_id"]) == bus_id:
            return gpu
    return gpus[0] if gpus else None


def _bus(pci):
    """The bus number of a PCI id ``DOMAIN:BUS:DEVICE.FUNCTION`` (hex), or None."""
    parts = pci.split(":")
    try:
        return int(parts[-2], 16)
    except (IndexError, ValueError):
        return None


def gpu():
    """The current CUDA device: name, PCI bus, SM and memory clocks (now, maximum, and the
    application clocks) and the driver, from ``nvidia-smi`` where it runs, else numba's
    device attributes (maximum clocks only)."""
    try:
        from numba import cuda

        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
        bus = int(device.PCI_BUS_ID)
        attributes = dict(
            name=name,
            max_sm_clock_mhz=int(device.CLOCK_RATE) // 1000,
            max_memory_clock_mhz=int(device.MEMORY_CLOCK_RATE) // 1000,
            clocks_from="numba's device attributes (maximum clocks)",
        )
    except Exception:  # (no driver, the simulator: the record says it does not know)
        bus, attributes = None, dict(name=None, clocks_from=None)
    query = ",".join(_SMI_FIELDS)
    smi = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"])
    found = parse_smi(smi, bus) if smi else None
    if found is not None and attributes["name"] in (None, found["name"]):
        return dict(found, clocks_from="nvidia-smi, when the record was started")
    return attributes


def device(kind):
    """The record's ``device`` of a ``"cuda"`` or ``"cpu"`` run, with its ``slug``."""
    if kind == "cuda":
        found = gpu()
    else:
        found = dict(name=cpu_name(), cores=os.cpu_count())
    found["slug"] = slug(found["name"] or f"unknown-{kind}")
    return found


def versions(kind):
    """Python's, moe-numba's and each installed package's of :data:`PACKAGES`; on a GPU run
    also the CUDA runtime torch was built for and the driver's CUDA version."""
    import moe_numba

    found = {"python": platform.python_version(), "moe_numba": moe_numba.__version__}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    if kind == "cuda":
        torch = sys.modules.get("torch")
        found["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        try:
            from numba import cuda

            found["driver_cuda"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
        except Exception:  # (no driver: not known)
            found["driver_cuda"] = None
    return found


def header(what, kind, argv, backend):
    """A record's header: ``what`` ran (``bench``, ``peers``, ``layer``, ...) on a ``kind``
    device (``"cuda"`` or ``"cpu"``) with the command line ``argv`` (after the command's
    name) on ``backend`` (a description of the arrays and kernels)."""
    head, dirty = commit()
    return dict(
        what=what,
        backend=backend,
        commit=head,
        dirty=dirty,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=shlex.join(["python", "-m", "benchmarks", *argv]),
        device=device(kind),
        versions=versions(kind),
    )
