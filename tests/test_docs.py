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


# --- facts the pages state -----------------------------------------------------------------

ROOT = DOCS.parent


def _flat(path):
    """The text of ``path`` with its line breaks and indentation as single spaces."""
    return " ".join(path.read_text().split())


def test_contract_expert_offsets_example():
    """contract.rst: the worked example's offsets, and what an override of 5 rows gives with
    and without validation."""
    import numpy as np

    from moe_numba import moe_permute

    text = _flat(DOCS / "contract.rst")
    assert "In the example above it is ``[2, 4, 6]``. With ``override_buffer_size = 5`` and " \
        "``validate=False`` it would be ``[2, 4, 5]``" in text  # fmt: skip
    assert "``validate=True`` refuses that buffer instead (a ``ValueError``: the routing map " \
        "needs 6 rows)" in text  # fmt: skip
    example = runpy.run_path(str(DOCS / "examples" / "worked_example.py"), run_name="docs_fact")
    args = [example[k] for k in ("hidden_states", "expert_routemap_topk", "expert_prob_topk")]
    call = dict(num_experts=3, tokens_per_expert=[1, 2, 1], padding_alignment=2)
    offsets = moe_permute(args[0], None, *args[1:], **call, return_expert_offsets=True)[-1]
    assert offsets.tolist() == [2, 4, 6]
    small = dict(call, override_buffer_size=5, return_expert_offsets=True)
    offsets = moe_permute(args[0], None, *args[1:], **small, validate=False)[-1]
    assert offsets.tolist() == [2, 4, 5] and offsets.dtype == np.int32
    with pytest.raises(ValueError, match="the routing map needs 6 rows"):
        moe_permute(args[0], None, *args[1:], **small, validate=True)


def test_quickstart_and_readme_facts():
    """The number of C extensions the install compiles, the extra for the tests, and the
    NumPy requirement, as pyproject.toml and the sources have them."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and newer")
    with open(ROOT / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)
    extensions = len(list(ROOT.glob("moe_cpu/*.pyx")) + list(ROOT.glob("moe_numba/**/*.pyx")))
    quickstart, readme = _flat(DOCS / "quickstart.rst"), _flat(ROOT / "README.md")
    assert f"this compiles {extensions} C extensions from Cython" in quickstart
    assert f"The install compiles {extensions} C extensions from Cython" in readme
    assert "for the tests, ``pip install -e '.[test]'``" in quickstart
    assert "pip install -e '.[test]'" in readme and '.[dev]"`` for the tests' not in quickstart
    numpy = [d for d in config["project"]["dependencies"] if d.startswith("numpy")]
    assert numpy == ["numpy>=2.0"]  # (no cap for the CPU backend, as the page says)
    assert "NumPy >= 2.0," in quickstart and "the CPU backend has no cap" in quickstart
    assert "numpy<2.5" in config["project"]["optional-dependencies"]["gpu"]
    assert "The ``gpu`` extra caps NumPy below 2.5" in quickstart


def test_backends_example():
    """The worked example of ``moe_numba.backends`` (its docstring) runs as written."""
    import doctest

    from moe_numba import backends

    failed, attempted = doctest.testmod(backends, verbose=False, report=False)[:2]
    assert attempted > 0 and failed == 0
