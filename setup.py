"""Build the Cython/OpenMP extensions of ``moe_cpu`` (all metadata lives in pyproject.toml).

OpenMP is probed by compiling and linking a tiny program with ``-fopenmp``; when that fails, or
when ``MOE_USE_OPENMP=0``, the extensions are built without it and every ``prange`` runs
serially (Cython guards its pragmas with ``#ifdef _OPENMP``). Set ``MOE_CYTHON_ANNOTATE=1`` to
write the annotated HTML next to the sources, and ``MOE_CYTHON_DEBUG=1`` for a bounds-checked
build (``boundscheck``, ``wraparound`` and ``initializedcheck`` on: every memoryview index is
checked; slower, for ``tox -e cpu-debug``).

The extensions are compiled in parallel, one C compiler process per CPU this process may run
on (``MOE_BUILD_JOBS=N`` or ``build_ext -j N`` sets the count), and each one's start and
finish is printed to stderr, which pip shows with ``pip install -v``.

Each compiled extension is kept in ``build/<kind of build>/kept/`` with a fingerprint of what
it was compiled from (its C source, which records the Cython version and the compile flags;
the headers and ``.pxd`` files it depends on; the compiler and its flags), and a later build
with the same fingerprint copies it instead of compiling again. ``pip install -e`` compiles in
a new temporary directory every time, and its fresh build environment makes Cython regenerate
every C file (its own ``.pxd`` files are newer), so timestamps cannot tell; without this every
install, of an extra that adds only dependencies say, compiled all eight again.
``build_ext --force`` (or deleting ``build/``) compiles every one.
"""

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_OMP_PROBE = """
#include <omp.h>
int main(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    return n < 1;
}
"""


def _load_switch():
    """moe_numba's parser of on/off variables, loaded by path (the package itself cannot be
    imported before it is built)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_numba", "_environment.py")
    spec = importlib.util.spec_from_file_location("_moe_environment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.switch


switch = _load_switch()


def openmp_flags():
    """Return the compile/link flags that enable OpenMP, or [] when it is unavailable."""
    if not switch("MOE_USE_OPENMP", True):
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


def cpu_count():
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def build_jobs():
    """Compiler processes to run at once: ``MOE_BUILD_JOBS``, else the CPU count."""
    text = os.environ.get("MOE_BUILD_JOBS", "").strip()
    if not text:
        return cpu_count()
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise SystemExit(f"MOE_BUILD_JOBS: expected a whole number of at least 1; got {text!r}")
    return jobs


def say(message):
    """One line on stderr, written at once: the extensions compile on several threads, and
    ``print`` writes a line's text and its end separately, so two lines could run together."""
    sys.stderr.write(f"moe-numba build: {message}\n")
    sys.stderr.flush()


class ParallelBuildExt(build_ext):
    """``build_ext`` that compiles the extensions in parallel by default, says on stderr
    when each one starts and ends (a build on one slow core otherwise looks hung), and keeps
    each compiled extension for the next build (see the module docstring)."""

    def finalize_options(self):
        if self.parallel is None:  # no -j given
            self.parallel = JOBS
        super().finalize_options()

    def build_extensions(self):
        jobs = self.parallel if self.parallel and self.parallel is not True else cpu_count()
        say(
            f"{len(self.extensions)} C extensions, compiled {jobs} at a time where their "
            "sources changed (C compiler: the CC environment variable, else Python's)"
        )
        super().build_extensions()

    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        kept = os.path.join(KEPT, self.get_ext_filename(ext.name))  # (the ABI tag included)
        stamp = fingerprint(ext)
        if not self.force and _read(kept + ".fingerprint") == stamp and os.path.exists(kept):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(kept, target)
            say(f"kept {ext.name}: compiled before from the same sources ({kept})")
            return
        start = time.perf_counter()
        say(f"compiling {ext.name} ...")
        super().build_extension(ext)
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        shutil.copy2(target, kept)
        with open(kept + ".fingerprint", "w") as f:
            f.write(stamp)
        say(f"compiled {ext.name} in {time.perf_counter() - start:.0f} s")


def fingerprint(ext):
    """What a compiled extension depends on, hashed: the contents of its sources and of the
    files it depends on, its compile and link settings, the compiler and its flags."""
    digest = hashlib.sha256()
    for path in sorted({*ext.sources, *ext.depends}):
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + f.read() + b"\0")
    settings = (
        ext.extra_compile_args,
        ext.extra_link_args,
        ext.libraries,
        ext.include_dirs,
        ext.define_macros,
        *(os.environ.get(name) for name in ("CC", "CFLAGS", "CPPFLAGS", "LDSHARED", "LDFLAGS")),
        sysconfig.get_config_var("CC"),
        sysconfig.get_config_var("CFLAGS"),
    )
    digest.update(repr(settings).encode())
    return digest.hexdigest()


def _read(path):
    """The text of the file at ``path``, or None where there is none."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


JOBS = build_jobs()  # (read first: a bad value stops the build before Cython runs)
omp, why = openmp_flags()
say(
    f"moe_cpu's OpenMP {'enabled' if omp else 'NOT used'} ({why})"
    + ("" if omp else ": prange loops run serially")
)
debug = switch("MOE_CYTHON_DEBUG", False)
if debug:
    say("MOE_CYTHON_DEBUG: memoryview indexing is bounds-checked")

# Each kind of build has its own build directory: the generated C and the compiled objects
# do not record the switches they were made with, and a build reuses whatever looks up to
# date, so a serial or debug wheel built after the default one would otherwise ship the
# default's extensions. The debug build's C (other directives) stays out of the source tree.
variant = "-".join(name for name, on in (("serial", not omp), ("debug", debug)) if on)
build_base = os.path.join("build", variant or "default")
KEPT = os.path.join(build_base, "kept")  # the compiled extensions of this kind of build

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
        ("_parallel", ["_parallel.pxd", "_threads.h"]),
        ("_memory", []),
        ("_permute", ["_common.pxd", "_parallel.pxd"]),
        ("_unpermute", ["_common.pxd", "_parallel.pxd", "_combine.h"]),
        ("_backward", ["_common.pxd", "_parallel.pxd", "_combine.h", "_backward.h"]),
        ("_sort_chunks", ["_common.pxd", "_parallel.pxd"]),
    ]
]
# the GPU launch path's C half (moe_numba.runtime._driver_c) and the torch replays' compiled
# half (moe_numba.torch._replay_c): no OpenMP, no libcuda at link time (the driver's
# functions come from the ctypes handle at run time)
for module in ("moe_numba.runtime._driver_c", "moe_numba.torch._replay_c"):
    source = module.replace(".", "/") + ".pyx"
    extensions.append(Extension(module, [source], depends=[source], extra_compile_args=["-O2"]))

setup(
    cmdclass={"build_ext": ParallelBuildExt},
    options={"build": {"build_base": build_base}},
    ext_modules=cythonize(
        extensions,
        build_dir=os.path.join(build_base, "cython") if debug else None,
        language_level=3,
        annotate=switch("MOE_CYTHON_ANNOTATE", False),
        compiler_directives={
            "boundscheck": debug,
            "wraparound": debug,
            "cdivision": True,
            "initializedcheck": debug,
        },
    ),
)
