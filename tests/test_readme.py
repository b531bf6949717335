"""The README: its usage example runs as written and does what its comments say, and CI runs
its set-up and test commands."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_usage_example():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has a Python example"
    namespace = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    assert namespace["rows"].shape == (12, 8)
    assert namespace["y"].shape == (4, 8)
    assert namespace["counts"] == [2, 2, 2]


def test_docs_quickstart_installs_as_the_readme_does():
    """CI runs the README's set-up command in a fresh venv; the quickstart shows the same."""
    readme = README.read_text()
    quickstart = (ROOT / "docs" / "quickstart.rst").read_text()
    command = (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . "
        "&& python -m moe_numba demo"
    )
    assert command in readme
    assert command in quickstart


def test_ci_runs_the_readme_test_command():
    """.ci/run installs and tests as the README says (in a venv of its own)."""
    lines = [
        line
        for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
        for line in block.splitlines()
    ]
    assert "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]'" in lines
    test_command = "python -m pytest && NUMBA_ENABLE_CUDASIM=1 python -m pytest -m sim -n auto"
    assert test_command in lines
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "pip install -q -e '.[test]'" in ci
    assert test_command in ci


def test_the_cpu_torch_command_installs_the_test_extras_torch():
    """The README's CPU-wheel command pins the torch that the test extra's range ends at:
    an installed ``X+cpu`` satisfies ``<=X``, so the extra's install keeps it (a newer build
    would be replaced by PyPI's CUDA build)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    newest = re.search(r'"torch>=[\d.]+,<=([\d.]+)"', pyproject).group(1)
    readme = README.read_text()
    assert f"pip install torch=={newest} --index-url https://download.pytorch.org/whl/cpu" in readme
    assert f"(`torch>=2.4,<={newest}`:" in readme and f"`{newest}+cpu` satisfies" in readme


def _commands(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return re.findall(r"^    (\w+)\b", done.stdout, flags=re.M)


def test_the_readme_names_every_command():
    """The README's line on the command lines names every command of each, in order."""
    readme = " ".join(README.read_text().split())
    assert _commands("moe_numba") == ["demo"]
    assert "`python -m moe_numba --help` lists the package's command (`demo`)" in readme
    listed = ", ".join(f"`{c}`" for c in _commands("benchmarks"))
    assert f"the benchmarks ({listed})" in readme
