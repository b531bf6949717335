"""The documentation: every example in docs/examples runs and passes its own asserts, and the
Sphinx build is free of warnings."""

import importlib.util
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))


def _param(path):
    # gpu_*.py examples need a real GPU; they define skip_reason() and main() instead of
    # running at import.
    marks = [pytest.mark.gpu] if path.name.startswith("gpu_") else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_examples_found():
    assert EXAMPLES, f"no examples under {DOCS / 'examples'}"


@pytest.mark.parametrize("path", [_param(p) for p in EXAMPLES])
def test_example(path):
    namespace = runpy.run_path(str(path), run_name="docs_example")
    if "main" in namespace:
        reason = namespace["skip_reason"]()
        if reason:
            pytest.skip(f"{path.name} {reason}")
        namespace["main"]()


_MISSING = [m for m in ("sphinx", "numpydoc") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(
    bool(_MISSING),
    reason=f"{' and '.join(_MISSING)} not installed; `tox -e docs` builds the docs",
)
def test_docs_build(tmp_path):
    command = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-q",
        "-b",
        "html",
        "-d",
        str(tmp_path / "doctrees"),
        str(DOCS),
        str(tmp_path / "html"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout}\n{done.stderr}"
