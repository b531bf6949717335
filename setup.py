"""Build the Cython/OpenMP extensions of ``moe_cpu`` (all metadata lives in pyproject.toml).

OpenMP is probed by compiling and linking a tiny program with ``-fopenmp``; when that fails, or
when ``MOE_USE_OPENMP=0``, the extensions are built without it and every ``prange`` runs
serially (Cython guards its pragmas with ``#ifdef _OPENMP``). Set ``MOE_CYTHON_ANNOTATE=1`` to
write the annotated HTML next to the sources.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from Cython.Build import cythonize
from setuptools import Extension, setup

_OMP_PROBE = """
#include <omp.h>
int main(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    return n < 1;
}
"""


def openmp_flags():
    """Return the compile/link flags that enable OpenMP, or [] when it is unavailable."""
    if os.environ.get("MOE_USE_OPENMP", "1").strip().lower() in ("0", "false", "no", "off"):
        return [], "disabled by MOE_USE_OPENMP"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    workdir = tempfile.mkdtemp(prefix="moe_omp_probe_")
    try:
        source = os.path.join(workdir, "probe.c")
        with open(source, "w") as f:
            f.write(_OMP_PROBE)
        done = subprocess.run(
            [*compiler, "-fopenmp", source, "-o", os.path.join(workdir, "probe")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    except OSError as exc:
        return [], f"probe could not run the compiler ({exc})"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if done.returncode != 0:
        return [], f"{compiler[0]} -fopenmp failed"
    return ["-fopenmp"], f"{compiler[0]} -fopenmp"


omp, why = openmp_flags()
print(
    f"moe_cpu: OpenMP {'enabled' if omp else 'NOT used'} ({why})"
    + ("" if omp else " -> prange loops run serially"),
    file=sys.stderr,
)

# -ffp-contract=off: the combine must round exactly where the contract says (explicit fmaf only).
compile_args = ["-O3", "-ffp-contract=off", *omp]
libraries = [] if sys.platform == "win32" else ["m"]

# depends: rebuild when these change, and ship them in the sdist (cythonize swaps the .pyx
# sources for the generated .c, so the .pyx is listed here too)
extensions = [
    Extension(
        f"moe_cpu.{name}",
        [f"moe_cpu/{name}.pyx"],
        depends=[f"moe_cpu/{name}.pyx", *(f"moe_cpu/{d}" for d in depends)],
        extra_compile_args=compile_args,
        extra_link_args=omp,
        libraries=libraries,
    )
    for name, depends in [
        ("_parallel", ["_parallel.pxd"]),
        ("_memory", []),
        ("_permute", ["_parallel.pxd"]),
        ("_unpermute", ["_parallel.pxd", "_combine.h"]),
        ("_backward", ["_parallel.pxd", "_combine.h", "_backward.h"]),
    ]
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        annotate=bool(os.environ.get("MOE_CYTHON_ANNOTATE")),
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)
